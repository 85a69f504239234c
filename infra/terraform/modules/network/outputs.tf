output "vpc_id" {
  description = "ID of the VPC."
  value       = module.vpc.vpc_id
}

output "vpc_cidr_block" {
  description = "IPv4 block of the VPC."
  value       = module.vpc.vpc_cidr_block
}

output "private_subnet_ids" {
  description = "Private subnets (nodes and pods), one per zone."
  value       = module.vpc.private_subnets
}

output "public_subnet_ids" {
  description = "Public subnets (load balancers, NAT), one per zone."
  value       = module.vpc.public_subnets
}

output "database_subnet_group_name" {
  description = "RDS subnet group over the database subnets."
  value       = module.vpc.database_subnet_group_name
}

output "database_subnet_cidrs" {
  description = "IPv4 blocks of the database subnets (NetworkPolicy egress to PostgreSQL)."
  value       = module.vpc.database_subnets_cidr_blocks
}

output "elasticache_subnet_group_name" {
  description = "ElastiCache subnet group over the cache subnets."
  value       = module.vpc.elasticache_subnet_group_name
}

output "elasticache_subnet_cidrs" {
  description = "IPv4 blocks of the cache subnets (NetworkPolicy egress to Redis)."
  value       = module.vpc.elasticache_subnets_cidr_blocks
}
